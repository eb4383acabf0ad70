// Package shuffle materialises the windows a trainer samples from a
// clipshard dataset, per epoch, in one shuffled order that any world size
// reads, into shard files that are read strictly sequentially
// (docs/FORMAT.md).
//
// The sample list of an epoch is derived from (seed, epoch) alone by the
// procedure in manifests.Samples, so it can be re-derived (verify does). Two
// execution paths give byte-identical output: an in-memory gather when the
// dataset fits the memory budget, and an external two-pass "pile" shuffle
// that reads the dataset blobs strictly sequentially when it does not.
package shuffle
