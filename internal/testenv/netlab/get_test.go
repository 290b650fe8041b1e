package netlab

import (
	"fmt"
	"net"
	"testing"
)

// The request leaves from inside the namespace: a server on the
// namespace's loopback answers, and the same address outside it is a
// different host.
func TestGetFetchesFromInsideTheNamespace(t *testing.T) {
	ns := Namespace(t, "kairon-get")
	// A port free on the host's loopback, so that if Get dialled from the
	// host namespace it would be refused rather than reach some server.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	ServeHTTP(t, ns, addr, "inside "+ns)

	body, err := Get(ns, "http://"+addr+"/")
	if err != nil {
		t.Fatalf("Get in %s: %v", ns, err)
	}
	if body != "inside "+ns {
		t.Fatalf("Get in %s returned %q, want the namespace's server", ns, body)
	}
	if body, err := Get(ns, fmt.Sprintf("http://127.0.0.1:%d/", port+1)); err == nil {
		t.Fatalf("Get of a port nobody listens on in %s returned %q", ns, body)
	}
}
