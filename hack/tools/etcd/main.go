// Command etcd is upstream etcd's own entry point, compiled from the pinned
// go.etcd.io/etcd/server/v3 module so the project needs no downloaded binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
