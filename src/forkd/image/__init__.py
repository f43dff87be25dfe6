"""Guest images: kernel, initramfs and root filesystem, built and cached by recipe."""
