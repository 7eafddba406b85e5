module github.com/warren/interop

go 1.22

require github.com/rabbitmq/amqp091-go v1.16.0
