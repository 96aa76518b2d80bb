# The project defines is_lead_worker more than once: a method that returns the function's test.
from pkg.distributed import is_lead_worker


class Agent:
    def __init__(self, args):
        self.args = args

    def is_lead_worker(self) -> bool:
        return is_lead_worker(self.args.rank)
