// Placeholder: the CUDA backend lands with the CUDA issue.
