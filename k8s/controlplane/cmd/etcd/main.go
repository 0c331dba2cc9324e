// Command etcd is etcd's own server (go.etcd.io/etcd/server/v3/etcdmain), at
// the version k8s.io/kubernetes pins in its go.mod, so that the control plane
// runs over the etcd its API server is built and tested against.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
