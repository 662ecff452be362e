"""Where the commands print: results to standard output, messages and progress to standard error.

Both wrap long lines softly, so a message stays one line also when the output is not a terminal.
"""

from rich.console import Console

#: Results: what a command was asked for (tables, records, summaries).
out = Console(soft_wrap=True)
#: Messages: progress, warnings, errors.
console = Console(stderr=True, soft_wrap=True)
