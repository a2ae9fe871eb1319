"""One compile from model to output directory: the stages in order, the report, the summary
and the output directory replaced whole."""
