//go:build !linux

package main

import "syscall"

// childAttr puts a child in its own process group, so that stopping it
// reaches what it started.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
