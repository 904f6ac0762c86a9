"""``python -m monarch_kernel.kernel -f CONNECTION_FILE``: what the kernelspec runs."""

from ipykernel.kernelapp import IPKernelApp

from monarch_kernel.kernel._kernel import MonarchKernel

if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=MonarchKernel)
