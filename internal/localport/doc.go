// Package localport finds a TCP port free on 127.0.0.1 for a process that
// will listen on it a moment later (etcd, kube-apiserver, kairon-ui); it is
// all in localport.go.
//
// A port from listening on port 0 comes from the kernel's ephemeral range,
// the same range every outgoing connection draws its local port from. On a
// busy host (an API server and etcd talking to each other, say) one of
// them can take the port between the check and the listen, and the
// process then fails with "address already in use". Ports below the
// ephemeral range are never handed to outgoing connections, so a port
// found free there stays free unless someone binds it on purpose.
package localport
