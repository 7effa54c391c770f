"""The processes: hand-off, intake, supervision, the shared block, IPC, the control plane (KIP-291)."""
