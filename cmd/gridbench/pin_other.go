//go:build !linux

package main

import "errors"

type cpuPin struct{ redisCPU int }

func pinApart(int, ...int) (*cpuPin, error) {
	return nil, errors.New("pinning Redis apart is implemented for Linux only")
}

func (*cpuPin) restore() error { return nil }
