// Package netlab builds the network of a test: namespaces the test
// creates, and the servers of its "outside" (DNS, plain TCP, TLS, HTTPS)
// on test addresses, so that guest traffic never leaves the machine.
// netlab.go holds the namespaces and servers; get.go, Get, an HTTP fetch
// made from inside a namespace.
package netlab
