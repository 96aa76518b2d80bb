# Guide: Mixed-Precision Training (gpu_training), "Why unscale-before-clip matters"
# (shared/seeds/000). Verbatim.
self._scaler.unscale_(self.optimizer)                       # undo loss scaling
grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm) # now correct
self._scaler.step(self.optimizer)                            # skips step on inf/NaN
self._scaler.update()                                        # adapt the scale factor
