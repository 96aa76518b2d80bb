# A library helper that logs only when its caller asks: every distributed caller passes
# verbose=is_primary(args); validate.py, which runs alone, passes True.
import logging

_logger = logging.getLogger(__name__)


def resolve_config(args, verbose=False):
    config = {"input_size": args.input_size}
    if verbose:
        _logger.info("Data processing configuration for current model + dataset:")
    return config
