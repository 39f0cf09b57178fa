"""rxelab testbed: build an image, wire a private data network and boot VMs that speak RDMA (rxe).

Terraform owns the lifecycle (terraform/); every step it takes is a command of this package
(`python -m infra ...`), so the same code serves Terraform, the Makefile and the tests.
"""
