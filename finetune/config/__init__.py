"""What a run is configured with: the argument dataclasses and the YAML recipe + flags that fill them."""
