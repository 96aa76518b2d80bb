# A single-process script calling the same helper: it does not run on ranks.
from pkg.config import resolve_config


def main(args):
    return resolve_config(args, verbose=True)
