package pickle

// SeedFiles gives the external tests the fixture files.
var SeedFiles = fixtureFiles
