module github.com/clipshard/clipshard

go 1.26

require github.com/nlpodyssey/gopickle v0.3.0

require golang.org/x/text v0.14.0 // indirect
