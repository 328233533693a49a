// Command pause is the pod sandbox's process for the local test nodes: it holds the pod's
// namespaces, reaps the zombies of a shared PID namespace, and exits 0 on SIGTERM or SIGINT.
// hack/build-images.sh packages it as registry.k8s.io/pause:3.10.1, the sandbox image
// containerd is configured to pin, so no registry is needed.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
