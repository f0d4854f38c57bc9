#!/bin/sh
ans "$(cat kbg)"
