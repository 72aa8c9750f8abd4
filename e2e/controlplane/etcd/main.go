// Command etcd is a thin wrapper around etcd's own server entry point.
//
// go.etcd.io/etcd/server/v3 carries `replace` directives in its go.mod, so
// `go install go.etcd.io/etcd/server/v3@vX` is refused. This module requires
// it as an ordinary dependency and calls the same function its main package
// calls, which gives a byte-for-byte equivalent etcd server.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
