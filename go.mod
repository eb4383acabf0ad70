module github.com/clipshard/clipshard

go 1.26

require github.com/nlpodyssey/gopickle v0.3.0

require (
	codeberg.org/sbinet/npyio v0.14.0 // indirect
	github.com/campoy/embedmd v1.0.0 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/x448/float16 v0.8.4 // indirect
	golang.org/x/text v0.34.0 // indirect
	gonum.org/v1/gonum v0.17.0 // indirect
)
