from ordersctl.cli import main

main()
