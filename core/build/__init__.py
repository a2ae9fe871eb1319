"""One compile: the session that runs the stages in order (``session``), the stage functions
(``pipeline``), the report and summary, and the output directory."""
