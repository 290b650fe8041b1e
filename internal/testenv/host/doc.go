// Package host finds what integration tests need from this machine: the
// pinned binaries of the checkout, and the processes running on it (host.go).
// It is apart from testenv so that tests of the control plane itself do not
// depend on Kairon's API package compiling.
package host
