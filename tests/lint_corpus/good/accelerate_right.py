# Accelerate done its own way: accumulate() around forward and backward, accelerator.print,
# accelerator.save, its logger (main process only by default), a raw write under
# is_main_process, and PartialState().is_last_process for pipeline outputs.
import torch
from accelerate import Accelerator, PartialState
from accelerate.logging import get_logger

logger = get_logger(__name__)


def training_function(args):
    accelerator = Accelerator(gradient_accumulation_steps=args.accum)
    model, optimizer, loader = accelerator.prepare(build_model(), build_optimizer(), build_loader())
    for epoch in range(args.epochs):
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        accelerator.print(f"epoch {epoch}")
        logger.info(f"epoch {epoch} done")
    accelerator.wait_for_everyone()
    accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
    if accelerator.is_main_process:
        torch.save({"epochs": args.epochs}, "meta.pt")
    if PartialState().is_last_process:
        print(f"Time of first pass: {args.first_batch}")
    accelerator.end_training()
