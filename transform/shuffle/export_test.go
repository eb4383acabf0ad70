package shuffle

// SetPass1Limits makes pass 1 read chunk bytes at a time and keep at most
// open files per writer; the returned func restores the defaults.
func SetPass1Limits(chunk int64, open int) func() {
	c, o := pass1Chunk, maxOpenShards
	pass1Chunk, maxOpenShards = chunk, open
	return func() { pass1Chunk, maxOpenShards = c, o }
}
