# Guide: Distributed Training Guide: strategies and memory, "Common Pitfalls"
# (shared/seeds/002). Verbatim.
if dist.get_rank() == 0:
    logger.info("Epoch %d loss: %.4f", epoch, loss)
