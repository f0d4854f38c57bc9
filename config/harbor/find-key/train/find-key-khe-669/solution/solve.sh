#!/bin/sh
ans "$(cat khe)"
