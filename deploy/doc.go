// Package deploy holds no code: its tests check the deploy files beside it
// (Dockerfiles, compose.yaml, k8s/) with the parsers the tools themselves
// use, since no Docker daemon, cluster or registry can be reached where
// `make test` runs. It is a module of its own so that the plugin's go.mod
// does not carry Kubernetes, compose-go and BuildKit; `go test ./...` at the
// repository root does not enter it (make deploy-check runs it).
package deploy
