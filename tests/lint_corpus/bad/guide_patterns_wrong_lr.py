# Guide: Distributed Training: patterns and synchronisation, the WRONG half of "Common
# Pitfall: Rank 0 Behaves Differently" (shared/seeds/003). Verbatim (re-indented) but for the
# expect marker.
# WRONG
if rank == 0:
    adjust_learning_rate(optimizer, epoch)  # expect: GT014

# At next step, rank 0 has different lr than others
# Divergence in training!
