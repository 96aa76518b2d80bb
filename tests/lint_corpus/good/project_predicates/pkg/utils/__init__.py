from .distributed import init_distributed_device, is_primary
from .summary import update_summary
