#!/bin/sh
ans "$(cat kfa)"
