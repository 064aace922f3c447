// Wrapper module: the real CRDs of sigs.k8s.io/lws, copied out of the pinned module.
module localkube/lws

go 1.26.0

require sigs.k8s.io/lws v0.7.0
