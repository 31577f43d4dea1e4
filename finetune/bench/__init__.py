"""What only ``finetune bench`` uses: its command, systems, scaling, FLOPs, host-read and op counts."""
