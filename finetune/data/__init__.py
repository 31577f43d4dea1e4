"""Reviews in, clean labelled splits out: sources, cleaning, splits, class weights."""
