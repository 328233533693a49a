// Command etcd is upstream etcd's own entry point, built from the Go module proxy
// so the local control plane gets a current 3.6.x server (Debian ships 3.4).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
