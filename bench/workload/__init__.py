"""What is trained: data sets, models, the factories of your own, and what a step costs."""

# installs the finder of users' files imported under a name of this package's (plugins'
# _UserFiles), so that a process started afresh finds them when it unpickles their objects
from bench.workload import plugins as _plugins  # noqa: F401
