// Package inspect computes what "clipshard inspect" shows of a dataset or
// an epochs folder: figures read through verify's structure check
// (manifests.Vouch, VouchEpochs: one checked way of loading every
// manifest) and from a bounded sample of the data, as typed reports the
// command prints (text, JSON, HTML). A file per question: dataset.go,
// values.go, clip.go, epochs.go, samples.go; open.go reads a folder's or a
// bucket's data.
package inspect
