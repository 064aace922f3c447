// Wrapper module: the real CRDs of sigs.k8s.io/jobset, copied out of the pinned module.
module localkube/jobset

go 1.26.0

require sigs.k8s.io/jobset v0.10.1
