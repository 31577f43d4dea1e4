"""Reviews in, clean labelled splits out: sources, the dataset catalog and fetch, cleaning, splits, class weights."""
