"""What every command runs on: the distributed run (DDP/FSDP init from torchrun or SLURM),
stop signals, atomic file writes, logging and progress lines, mixed precision. Depends on no
stage of the pipeline."""
