"""Bad input and faults: one line naming the problem and the fix, exit status 2, nothing on disk touched."""
