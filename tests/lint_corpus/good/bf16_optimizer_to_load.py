# An inference script that builds an AdamW over a bf16 model only to load a training
# checkpoint's optimizer state (distributed checkpoint): nothing is stepped, so the missing
# fp32 master weights cost nothing here (GT019 is not a finding).
import torch
import torch.distributed.checkpoint as dcp
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("/data/model", torch_dtype=torch.bfloat16).to("cuda")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
dcp.load(state_dict=state, checkpoint_id="/shared/checkpoints/last")
with torch.no_grad():
    tokens = model.generate(torch.tensor([[1, 2, 3]], device="cuda"))
