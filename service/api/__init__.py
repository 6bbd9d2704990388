"""The gRPC front end's parts: intake (prepare/submit), Generate streams, model RPCs, proto conversion."""
