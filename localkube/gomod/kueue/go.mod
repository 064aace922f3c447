// Wrapper module: the real CRDs of sigs.k8s.io/kueue, copied out of the pinned module.
module localkube/kueue

go 1.26.0

require sigs.k8s.io/kueue v0.14.0
