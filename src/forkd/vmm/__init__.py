"""The QEMU driver: command lines, processes, QMP, disks, and the fork and branch mechanics."""
