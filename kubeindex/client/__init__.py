"""The API server's client: HTTP/1.1 on connections of its own, TLS, the watch stream's framing
and protobuf decoded into the model's projections. The only layer that talks to the API."""
