"""The `prepare` stage: raw records (a built-in data set or the user's file or BEIR folder) ->
normalised, deduplicated, split tables. `prepared` is the format every later stage reads."""
