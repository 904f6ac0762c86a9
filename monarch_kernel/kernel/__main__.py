"""``python -m monarch_kernel.kernel -f CONNECTION_FILE``: what the kernelspec runs."""

from ipykernel.kernelapp import IPKernelApp

from monarch_kernel.controller import prefer_huge_pages
from monarch_kernel.kernel._kernel import MonarchKernel

if __name__ == "__main__":
    prefer_huge_pages()  # before user code allocates tensors
    IPKernelApp.launch_instance(kernel_class=MonarchKernel)
