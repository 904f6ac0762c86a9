"""Generated from proto/monarch_kernel/v1/agent.proto by grpcio-tools (`make stubs`).

Do not edit: tests/unit/test_generated_stubs.py fails when these drift from the proto.
"""
