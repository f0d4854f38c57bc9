#!/bin/sh
ans "$(cat khf)"
