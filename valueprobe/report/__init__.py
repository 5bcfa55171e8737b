"""The self-contained HTML report and its figures, one function per figure."""
