"""``python -m monarch_kernel.kernel -f CONNECTION_FILE``: what the kernelspec runs."""

from ipykernel.kernelapp import IPKernelApp

from monarch_kernel.kernel._kernel import MonarchKernel
from monarch_kernel.mesh._buffers import prefer_huge_pages

if __name__ == "__main__":
    prefer_huge_pages()  # before user code allocates tensors
    IPKernelApp.launch_instance(kernel_class=MonarchKernel)
