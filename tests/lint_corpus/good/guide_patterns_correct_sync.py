# Guide: Distributed Training: patterns and synchronisation, the CORRECT halves of "Common
# Pitfall: Rank 0 Behaves Differently" and "Avoiding Deadlocks" (shared/seeds/003).
# Verbatim, re-indented.
# CORRECT
# (or broadcast from rank 0)

adjust_learning_rate(optimizer, epoch)

# CORRECT
validate(model, val_loader)

# Or synchronize explicitly
dist.barrier()
